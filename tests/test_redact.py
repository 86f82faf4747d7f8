"""A database URL's password is hidden in every form it can take (queue/db.py `redact`)."""

from __future__ import annotations

import pytest

from sidelinja_worker.queue.db import redact

SECRET = "Hemmelig"  # in each case below, the password contains this word


@pytest.mark.parametrize(
    "url, expected",
    [
        ("postgresql://u:Hemmelig@h/db", "postgresql://u:***@h/db"),
        ("postgres://u:Hemmelig@h:5432/db", "postgres://u:***@h:5432/db"),
        ("postgresql://u:Hemmelig@h1:5432,h2:5433/db", "postgresql://u:***@h1:5432,h2:5433/db"),
        ("postgresql://u:Hemmelig@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
        (
            "postgresql://u:Hemmelig@/db?host=/run/postgresql",
            "postgresql://u:***@/db?host=/run/postgresql",
        ),
        # percent-encoded, and the characters that break a naive parser, unencoded
        ("postgresql://u:Hemmelig%40%3A%2F%3F@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:p@Hemmelig@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:Hemmelig?x#y@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:Hemme/lig@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:Hem/me?lig@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:Hemmelig:2@h/db", "postgresql://u:***@h/db"),
        # the password as a query parameter, its name in any case or percent-encoded
        ("postgresql://u@h/db?password=Hemmelig", "postgresql://u@h/db?password=***"),
        (
            "postgresql://h/db?user=u&password=Hemmelig&sslmode=require",
            "postgresql://h/db?user=u&password=***&sslmode=require",
        ),
        ("postgresql://h/db?PASSWORD=Hemmelig#x", "postgresql://h/db?PASSWORD=***#x"),
        ("postgresql://h/db?pass%77ord=Hemmelig", "postgresql://h/db?pass%77ord=***"),
        ("postgresql://h/db?sslpassword=Hemmelig", "postgresql://h/db?sslpassword=***"),
        ("postgresql://u:Hemmelig@h/db?password=Hemmelig2", "postgresql://u:***@h/db?password=***"),
        # keyword/value DSNs
        ("host=h user=u password=Hemmelig dbname=d", "host=h user=u password=*** dbname=d"),
        ("host=h password = Hemmelig", "host=h password = ***"),
        ("password='Hemmelig med mellomrom' host=h", "password=*** host=h"),
        (r"password='Hemmelig \' escaped' host=h", "password=*** host=h"),
        ("host=h sslpassword=Hemmelig", "host=h sslpassword=***"),
        ("password='Hemmelig unterminated", "password=***"),
        # whitespace around the URL (a secret file's blank first line), which libpq ignores
        (" postgresql://u:Hemmelig@h/db", "postgresql://u:***@h/db"),
        ("\n\tpostgresql://u:Hemmelig@h/db\n", "postgresql://u:***@h/db"),
        # shapes it does not recognise: what lies between user: and @ goes
        ("postgresql:/u:Hemmelig@h/db", "postgresql:/u:***@h/db"),
        ("postgresql:u:Hemmelig@h/db", "postgresql:u:***@h/db"),
        ("postgresql ://u:Hemmelig@h/db", "postgresql :***@h/db"),
        ("u:Hemmelig@h/db", "u:***@h/db"),
        ("postgresql:/u:Hemme@lig@h/db", "postgresql:/u:***@h/db"),
    ],
)
def test_the_password_is_hidden(url: str, expected: str) -> None:
    assert redact(url) == expected
    assert SECRET not in redact(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/db",
        "postgresql://h:5432/db?sslmode=require&application_name=a@b",
        "postgresql:///db",
        "host=h user=u dbname=d",
        "",
    ],
)
def test_a_url_without_a_password_is_unchanged(url: str) -> None:
    assert redact(url) == url
