import pytest

from tasks.util.urls import conceal, redact, redact_text, reveal


def test_user_info_and_signature_parameters_are_masked():
    assert redact("https://u:pw@host.org/a.csv") == "https://***@host.org/a.csv"
    assert (
        redact("https://host.org/a.csv?X-Amz-Signature=abc&X-Amz-Security-Token=t&part=2")
        == "https://host.org/a.csv?X-Amz-Signature=***&X-Amz-Security-Token=***&part=2"
    )
    assert (
        redact("https://blob.core.windows.net/c/a.csv?sv=2024&sig=xyz")
        == "https://blob.core.windows.net/c/a.csv?sv=2024&sig=***"
    )
    for plain in (
        "local:///tmp/x",
        "s3://bucket/prefix",
        "https://host.org/a.csv?page=2",
        "data/raw/a.csv",
    ):
        assert redact(plain) == plain  # nothing to hide: unchanged, byte for byte


def test_urls_inside_messages_are_masked():
    assert (
        redact_text("GET ftp://me:pw@10.0.0.1/x failed (see http://h/?token=t)")
        == "GET ftp://***@10.0.0.1/x failed (see http://h/?token=***)"
    )


def test_conceal_keeps_the_real_url_in_this_process_only():
    real = "https://u:pw@example.org/c.csv"
    shown = conceal(real)
    assert shown == "https://***@example.org/c.csv" and reveal(shown) == real
    assert conceal("https://example.org/c.csv") == "https://example.org/c.csv"


@pytest.mark.parametrize(
    "url, loopback",
    [
        ("http://127.0.0.1:5000/x", True),
        ("http://localhost/", True),
        ("http://[::1]:80/", True),
        ("http://127.9.9.9/", True),
        ("http://127.attacker.example/", False),
        ("http://127.0.0.1.nip.io/", False),
        ("http://10.0.0.1/", False),
        ("https://example.com/", False),
    ],
)
def test_is_loopback_by_address_not_by_prefix(url, loopback):
    from tasks.util.urls import is_loopback

    assert is_loopback(url) is loopback


def test_passwords_with_any_characters_are_redacted_in_text():
    """By the URL's structure, not a character class: quotes, brackets and spaces-free symbols in
    the password."""
    from tasks.util.urls import redact_text

    for password in (
        "pa(ss)",
        "it's",
        'qu"ote',
        "a[b]{c}",
        "x<y>z",
        "semi;colon",
        "pct%40sign",
        "at@sign",
    ):
        line = (
            f"zhpipe run smoke --source https://alice:{password}@example.org/corpus.csv --set "
            "train.epochs=2"
        )
        shown = redact_text(line)
        assert password not in shown and "alice" not in shown, shown
        assert shown.endswith("***@example.org/corpus.csv --set train.epochs=2"), shown
    assert redact_text("s3://bucket/key and ftp://host/x") == "s3://bucket/key and ftp://host/x"
