"""The decision core: plain objects that know nothing of Flask, Redis or SQL."""
