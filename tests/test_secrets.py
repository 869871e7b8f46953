"""Nothing secret reaches an index: secret files are skipped, secret values redacted.

The secrets are generated here, in the shapes real ones have (never real keys), then
looked for in every byte of the index directory and through every search mode.
"""

from __future__ import annotations

import base64
import json
import random
import string
from pathlib import Path

import pytest

from ssindex.config import ConfigError, config_from_mapping
from ssindex.text.secrets import redact, secret_file, secret_name
from tests.conftest import cli_json, run_cli

_RNG = random.Random(20261201)


def _token(alphabet: str, n: int) -> str:
    return "".join(_RNG.choice(alphabet) for _ in range(n))


_ALNUM = string.ascii_letters + string.digits
_UPPER = string.ascii_uppercase + string.digits


def _jwt() -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return (f"{part({'alg': 'HS256', 'typ': 'JWT'})}."
            f"{part({'sub': _token(string.digits, 10), 'name': 'Ada'})}.{_token(_ALNUM, 43)}")


def _key_body() -> list[str]:
    return [_token(_ALNUM + "+/", 64) for _ in range(6)]


SECRETS: dict[str, str] = {
    "aws_access_key": "AKIA" + _token(_UPPER, 16),
    "aws_secret_key": _token(_ALNUM + "/+", 40),
    "github_token": "ghp_" + _token(_ALNUM, 36),
    "github_pat": "github_pat_" + _token(_ALNUM + "_", 82),
    "gitlab_token": "glpat-" + _token(_ALNUM, 20),
    "slack_token": f"xoxb-{_token(string.digits, 12)}-{_token(string.digits, 13)}-"
                   f"{_token(string.ascii_lowercase + string.digits, 24)}",
    "slack_webhook": f"https://hooks.slack.com/services/T{_token(_UPPER, 8)}/"
                     f"B{_token(_UPPER, 8)}/{_token(_ALNUM, 24)}",
    "stripe_key": "sk_live_" + _token(_ALNUM, 24),
    "google_api_key": "AIza" + _token(_ALNUM + "_-", 35),
    "sendgrid_key": f"SG.{_token(_ALNUM, 22)}.{_token(_ALNUM, 43)}",
    "pypi_token": "pypi-AgEIcHlwaS5vcmc" + _token(_ALNUM, 80),
    "openai_key": f"sk-{_token(_ALNUM, 20)}T3BlbkFJ{_token(_ALNUM, 20)}",
    "jwt": _jwt(),
    "basic_auth": "S3cr3t" + _token(_ALNUM, 10),
    "password": _token(_ALNUM + "!#%&", 24),
    "api_key": _token(string.hexdigits.lower(), 32),
    "azure_storage_key": _token(_ALNUM + "+/", 86) + "==",
    "npm_token": "npm_" + _token(_ALNUM, 36),
}
KEY_BODY = _key_body()
FILE_SECRETS = {"env": _token(_ALNUM, 30), "ssh": _token(_ALNUM, 64),
                "npmrc": "npm_" + _token(_ALNUM, 36), "gcp": _token(_ALNUM, 64),
                "kube": _token(_ALNUM, 48), "netrc": _token(_ALNUM, 20),
                "pem": _token(_ALNUM, 64)}

CLIENT = '''"""A deployment client."""

import requests

AWS_ACCESS_KEY_ID = "{aws_access_key}"
aws_secret_access_key = "{aws_secret_key}"
GITHUB_TOKEN = "{github_token}"
FINE_GRAINED = "{github_pat}"
GITLAB = "{gitlab_token}"
STRIPE_KEY = "{stripe_key}"
MAPS_KEY = "{google_api_key}"
MAIL = "{sendgrid_key}"


def deploy(session_token: str = "{jwt}") -> None:
    """Push the release, then tell the team."""
    password = "{password}"
    requests.post("https://deploy:{basic_auth}@example.com/release", auth=password)
    requests.post("{slack_webhook}", json={{"text": "released"}})


SIGNING_KEY = """-----BEGIN RSA PRIVATE KEY-----
{key_body}
-----END RSA PRIVATE KEY-----"""


def notify(channel: str) -> str:
    return "{slack_token}" + channel
'''
CONFIG = '''[service]
name = uploader
api_key = {api_key}
region = eu-west-1
'''
CI = '''publish:
  script:
    - echo "//registry.npmjs.org/:_authToken={npm_token}" > ~/.npmrc
    - twine upload -u __token__ -p {pypi_token} dist/*
  variables:
    OPENAI: "{openai_key}"
    STORAGE: "DefaultEndpointsProtocol=https;AccountName=x;AccountKey={azure_storage_key}"
'''


def _tree(root: Path) -> Path:
    root.mkdir()
    (root / "client.py").write_text(CLIENT.format(**SECRETS, key_body="\n".join(KEY_BODY)))
    (root / "settings.ini").write_text(CONFIG.format(**SECRETS))
    (root / "ci.yml").write_text(CI.format(**SECRETS))
    (root / "README.md").write_text("# Uploader\n\nUploads releases to the store.\n")
    (root / ".env").write_text(f"AWS_SECRET_ACCESS_KEY={FILE_SECRETS['env']}\nDEBUG=1\n")
    (root / ".env.example").write_text("AWS_SECRET_ACCESS_KEY=\nDEBUG=\n")
    (root / ".env.sample").write_text(f"TOKEN={FILE_SECRETS['env']}\n")
    (root / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n"
                                     f"{FILE_SECRETS['ssh']}\n-----END OPENSSH PRIVATE KEY-----\n")
    (root / "server.pem").write_text("-----BEGIN PRIVATE KEY-----\n"
                                     f"{FILE_SECRETS['pem']}\n-----END PRIVATE KEY-----\n")
    (root / ".npmrc").write_text(f"//registry.npmjs.org/:_authToken={FILE_SECRETS['npmrc']}\n")
    (root / ".netrc").write_text(
        f"machine example.com login ada password {FILE_SECRETS['netrc']}\n")
    (root / ".git-credentials").write_text(f"https://ada:{FILE_SECRETS['netrc']}@github.com\n")
    (root / "credentials.json").write_text(json.dumps(
        {"type": "service_account", "private_key": FILE_SECRETS["gcp"], "client_email": "a@b"}))
    kube = root / ".kube"
    kube.mkdir()
    (kube / "config").write_text("apiVersion: v1\nkind: Config\nusers:\n- name: ada\n  user:\n"
                                 f"    token: {FILE_SECRETS['kube']}\n")
    (root / "cert.p12").write_bytes(b"0\x82\x01" + FILE_SECRETS["pem"].encode())
    return root


def _every_secret() -> list[str]:
    return [*SECRETS.values(), *KEY_BODY, *FILE_SECRETS.values()]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    root = _tree(tmp_path_factory.mktemp("secrets") / "repo")
    stats = cli_json("build", str(root), "--no-progress")
    return root, stats


def test_no_secret_is_in_any_index_file(built: tuple[Path, dict[str, object]]) -> None:
    root, _ = built
    index = root / ".ssindex"
    blobs = [path.read_bytes() for path in index.rglob("*") if path.is_file()]
    assert blobs
    leaked = [s for s in _every_secret() if any(s.encode() in blob for blob in blobs)]
    assert leaked == []


def test_secret_files_are_skipped_and_counted(built: tuple[Path, dict[str, object]]) -> None:
    root, stats = built
    skipped = stats["files_skipped"]
    assert isinstance(skipped, dict)
    # .env, .env.sample (filled in), id_ed25519, server.pem, .npmrc, .netrc,
    # .git-credentials, credentials.json, .kube/config, cert.p12
    assert skipped["secret"] == 10
    status = cli_json("status", "--index", str(root / ".ssindex"))
    assert status["files_skipped"]["secret"] == 10
    assert status["secrets"] == f"10 files skipped, {stats['secrets_redacted']} values redacted"
    listing = run_cli("search", "debug", "--index", str(root / ".ssindex"), "--json",
                      "--mode", "lexical", "--no-abstain").stdout
    paths = {hit["path"] for hit in json.loads(listing)["results"]}
    assert ".env.example" in paths  # a template without values is indexed
    assert not paths & {".env", ".env.sample"}


def test_values_are_redacted_in_place(built: tuple[Path, dict[str, object]]) -> None:
    root, stats = built
    assert stats["secrets_redacted"] == len(SECRETS) + 1  # and the key block, once
    hits = cli_json("search", "deploy the release password", "--index",
                    str(root / ".ssindex"), "--mode", "lexical", "--no-abstain")["results"]
    chunk = next(h for h in hits if h["path"] == "client.py" and "password =" in h["text"])
    original = (root / "client.py").read_text().splitlines()
    lines = chunk["text"].splitlines()
    assert len(lines) == chunk["end_line"] - chunk["start_line"] + 1
    for offset, line in enumerate(lines):  # every line where it was, the rest of it intact
        before = original[chunk["start_line"] - 1 + offset]
        if "[REDACTED:" in line:
            prefix = line.split("[REDACTED:")[0]
            assert before.startswith(prefix)
        else:
            assert line == before


@pytest.mark.parametrize("mode", ["lexical", "semantic", "hybrid"])
def test_no_search_returns_a_secret(built: tuple[Path, dict[str, object]], mode: str) -> None:
    from ssindex import Searcher

    root, _ = built
    searcher = Searcher(root / ".ssindex")  # the search of the CLI and the MCP server
    for secret in _every_secret():
        found = searcher.search(secret, k=20, mode=mode, abstain=False).results
        assert not any(secret in hit["text"] for hit in found), secret
    found = cli_json("search", "aws secret access key", "--index", str(root / ".ssindex"),
                     "--mode", mode, "--no-abstain", "-k", "50")["results"]
    assert found and not any(s in hit["text"] for hit in found for s in _every_secret())


def test_allow_secrets_indexes_them_and_says_so(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    stats = cli_json("build", str(root), "--no-progress", "--allow-secrets")
    assert stats["secrets_allowed"] is True
    assert "secret" not in stats["files_skipped"]
    table = run_cli("build", str(root), "--no-progress", "--allow-secrets").stdout
    assert "allowed (--allow-secrets)" in table
    found = cli_json("search", SECRETS["github_token"], "--index", str(root / ".ssindex"),
                     "--mode", "lexical", "--no-abstain")["results"]
    assert any(SECRETS["github_token"] in hit["text"] for hit in found)
    # turning the rule back on re-reads every file: the index loses what it held
    stats = cli_json("build", str(root), "--no-progress")
    assert stats["files_skipped"]["secret"] == 10
    blobs = [p.read_bytes() for p in (root / ".ssindex").rglob("*") if p.is_file()]
    assert not any(s.encode() in blob for blob in blobs for s in _every_secret())


def test_allow_secrets_config_key_is_a_checked_boolean() -> None:
    assert config_from_mapping({"walk": {"allow_secrets": True}}).walk.allow_secrets
    with pytest.raises(ConfigError, match="allow_secrets must be bool"):
        config_from_mapping({"walk": {"allow_secrets": "yes"}})
    with pytest.raises(ConfigError, match="max_file_bytes must be int"):
        config_from_mapping({"walk": {"max_file_bytes": True}})


def test_ordinary_code_is_left_alone() -> None:
    code = ('token = tokenizer.next_token()\npassword = getpass.getpass("Password: ")\n'
            'API_KEY = os.environ["API_KEY"]\nsecret_name = "database-password"\n'
            'url = "https://docs.python.org/3/library/secrets.html"\n'
            'key = hashlib.sha256(data).hexdigest()\npassword = "${DB_PASSWORD}"\n')
    assert redact(code) == (code, {})


def test_key_blocks_lose_their_body_and_nothing_else() -> None:
    body = "\n".join(KEY_BODY)
    whole = f'KEY = """-----BEGIN EC PRIVATE KEY-----\n{body}\n-----END EC PRIVATE KEY-----"""\n'
    out, found = redact(whole + "x = 1\n")
    assert found == {"private_key": 1} and not any(line in out for line in KEY_BODY)
    assert out.splitlines()[0] == 'KEY = """-----BEGIN EC PRIVATE KEY-----'
    assert out.count("\n") == whole.count("\n") + 1 and out.endswith("x = 1\n")
    escaped = '{"private_key": "-----BEGIN PRIVATE KEY-----\\n%s\\n-----END PRIVATE KEY-----"}'
    out, found = redact(escaped % "\\n".join(KEY_BODY))
    assert found == {"private_key": 1} and not any(line in out for line in KEY_BODY)
    cut = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{body}\nQyNTUxOQ\nthe notes go on\n"
    out, found = redact(cut)
    assert found == {"private_key": 1} and out.endswith("\nthe notes go on\n")
    assert "QyNTUxOQ" not in out and not any(line in out for line in KEY_BODY)
    # a header alone (a parser's check, a doc) keeps the rest of the file
    check = 'if pem.startswith("-----BEGIN RSA PRIVATE KEY-----"):\n    return load(pem)\n'
    assert redact(check + "def other():\n    return 1\n")[1] == {}


def test_names_and_contents_that_make_a_secret_file() -> None:
    assert secret_name("deploy/id_rsa") and secret_name("id_ed25519.pub")
    assert secret_name(".env.production") and not secret_name(".env.example")
    assert not secret_name("src/environment.py") and not secret_name("id_rsa.go")
    assert secret_file(".env.example", "TOKEN=abc\n")
    assert not secret_file(".env.example", "# the token\nTOKEN=\nDEBUG=''\n")
    assert secret_file("certs/ca.key", "-----BEGIN EC PRIVATE KEY-----\nabc\n")
    assert not secret_file("certs/ca.pem", "-----BEGIN CERTIFICATE-----\nabc\n")
    assert not secret_file(".npmrc", "registry=https://registry.npmjs.org/\n")
    assert not secret_file("deploy/config.yaml", "kind: Config\nname: x\n")
