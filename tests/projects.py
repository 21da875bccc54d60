"""A `flask` command on a fresh app in this process, as a new `flask` process would run it
(without the seconds of imports each process takes): the quota CLI tests' project."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from inspect import signature
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import create_engine, inspect, text

from flask_quota import Quota

SEPARATE_BY_DEFAULT = "mix_stderr" not in signature(CliRunner.__init__).parameters


def cli_runner(app: Flask) -> Any:
    """A CLI runner keeping stderr apart from stdout: click < 8.2 mixes them unless told."""
    if SEPARATE_BY_DEFAULT:
        return app.test_cli_runner()
    return app.test_cli_runner(mix_stderr=False)


@dataclass
class Result:
    code: int
    output: str  # stdout and stderr, interleaved
    stdout: str = ""
    stderr: str = ""


class Project:
    """An app whose every `flask ...` command is a fresh app, as a new process would be.

    ``host_db``: the app keeps the quota tables in its Flask-SQLAlchemy ``db``
    (``Quota(app, db=db)``); otherwise in ``QUOTA_DATABASE_URL``.
    """

    def __init__(self, directory: Path, url: str, *, host_db: bool = False) -> None:
        self.directory = directory
        self.url = url
        self.host_db = host_db

    @contextmanager
    def app(self) -> Iterator[Flask]:
        app = Flask(__name__, instance_path=str(self.directory / "instance"))
        db = None
        if self.host_db:
            app.config["SQLALCHEMY_DATABASE_URI"] = self.url
            db = SQLAlchemy(app)
        else:
            app.config["QUOTA_DATABASE_URL"] = self.url
        # As in a `flask` process, the app is made inside the command's click context
        # (where the SQL store never starts on its own: migrations find it untouched).
        with click.Context(click.Command("flask")):
            Quota(app, db=db)
        try:
            yield app
        finally:
            app.extensions["quota"].sql.close()
            if db is not None:
                with app.app_context():
                    db.engine.dispose()

    def run(self, *args: str) -> Result:
        with self.app() as app:
            result = cli_runner(app).invoke(args=list(args))
        # click < 8.2, told to keep stderr apart, leaves it out of ``output``; from 8.2
        # ``output`` is both streams as the terminal shows them.
        output = result.output if SEPARATE_BY_DEFAULT else result.stdout + result.stderr
        return Result(result.exit_code, output, result.stdout, result.stderr)

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.code == 0, f"{args}: {result.output}"
        return result.output

    def create_all(self) -> None:
        """The host's own ``db.create_all()``."""
        with self.app() as app, app.app_context():
            app.extensions["sqlalchemy"].create_all()

    def tables(self) -> set[str]:
        engine = create_engine(self.url)
        try:
            return set(inspect(engine).get_table_names())
        finally:
            engine.dispose()

    def execute(self, sql: str) -> None:
        engine = create_engine(self.url)
        try:
            with engine.begin() as conn:
                conn.execute(text(sql))
        finally:
            engine.dispose()
