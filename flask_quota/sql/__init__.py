"""Plans, clients, overrides and the audit log in SQL, and each process's snapshot of them.

``models`` (the tables), ``engine`` (our own, bounded engine), ``schema`` (first-use
setup), ``sync`` (the background thread), ``store`` (``SqlStore``, what the extension
holds), ``mapping`` (rows to plans, snapshot entries and operator views), ``snapshot``
(what requests read), ``admin`` (audited operator changes) with ``inputs`` (their
checked arguments), ``plansync`` (who owns the plans), ``apikeys``, ``migrate`` (the
shipped Alembic migrations) and ``errors``.
"""
