"""Small Flask apps that tests serve with gunicorn."""
