"""Secrets: files that are secrets by nature, and secret values inside source.

An index is what gets uploaded (``--index s3://…``), baked into an image or
handed to an agent, so nothing secret may reach it. The walk skips files that
are secrets by nature (``secret_file``) and redacts secret values in the rest
(``redact``) before anything is chunked, embedded or stored: a value becomes
``[REDACTED:kind]``, and lines and line numbers stay as they were.

The token formats are detect-secrets' detectors (their regular expressions). What
is written here is how they are run: each detector's regexes only on the lines
holding one of its literal triggers (``Detector.triggers``). Running the
detectors over every line costs 3.5 s on the standard library's 31 MB, a third of
a build's CPU side; a substring search for the triggers costs a small fraction.
Two kinds detect-secrets reports differently are written here too: a private
key *block* (it reports the header line, and the block must go), and a
high-entropy value assigned to a secret-sounding name (its keyword detector
matches any value, ``password = None`` included).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from ahocorasick_rs import AhoCorasick
from detect_secrets.plugins import (
    aws,
    azure_storage_key,
    basic_auth,
    github_token,
    gitlab_token,
    jwt,
    npm,
    openai,
    pypi_token,
    sendgrid,
    slack,
    square_oauth,
    stripe,
)

SECRETS_VERSION = 1
"""Bumped whenever what is skipped or redacted changes: part of the settings fingerprint."""


@dataclass(frozen=True)
class Detector:
    """One kind of secret value: its regexes, and literals every match contains."""

    kind: str
    patterns: tuple[re.Pattern[str], ...]
    triggers: tuple[str, ...]
    folded: bool = False
    """The triggers are sought in the lower-cased text."""
    valid: Callable[[str], bool] | None = None
    group: int | None = 0
    """The regex group that is the secret; ``None``: the last one that matched."""


def _shannon(value: str) -> float:
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


_SECRET_NAME = (r"[\w.-]*(?:passw(?:or)?d|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
                r"auth[_-]?key|private[_-]?key|credentials?)[\w.-]*")
_QUOTED = re.compile(  # key = "value", "key": "value", key: 'value', key := `value`
    rf"(?i)\b{_SECRET_NAME}[\"']?\s*(?::=|=>|==|=|:)\s*[rbuf]{{0,2}}([\"'`])([^\"'`\s]{{8,}})\1")
_BARE = re.compile(  # a config line: KEY=value, key: value (.env, .ini, YAML, properties)
    rf"(?im)^[ \t]*(?:export[ \t]+)?{_SECRET_NAME}[ \t]*[=:][ \t]*"
    rf"([^\s\"'`#;,()\[\]{{}}]{{12,}})[ \t]*$")
_PLACEHOLDER = re.compile(r"(?i)\$\{|\{\{|<|%\(|%s|example|changeme|your_|xxxx|\*\*\*")


def _random_looking(value: str) -> bool:
    """Whether an assigned value looks generated rather than typed: letters and digits,
    varied characters, no template syntax."""
    return (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
            and _shannon(value) >= 3.0 and not _PLACEHOLDER.search(value))


def _jwt(value: str) -> bool:
    return jwt.JwtTokenDetector.is_formally_valid(value)


DETECTORS: tuple[Detector, ...] = (
    Detector("aws_access_key", (aws.AWSKeyDetector.denylist[0],),
             ("AKIA", "ASIA", "ABIA", "ACCA", "A3T")),
    Detector("aws_secret_key", (aws.AWSKeyDetector.denylist[1],), ("aws",), folded=True,
             group=1),
    Detector("github_token", (*github_token.GitHubTokenDetector.denylist,
                              re.compile(r"github_pat_[A-Za-z0-9_]{60,}")),
             ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
    Detector("gitlab_token", tuple(gitlab_token.GitLabTokenDetector.denylist),
             ("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "GR1348941", "glcbt-",
              "glimt-", "glptt-", "glagent-", "gloas-")),
    Detector("slack_token", tuple(slack.SlackDetector.denylist), ("xox", "hooks.slack.com"),
             folded=True),
    Detector("stripe_key", tuple(stripe.StripeDetector.denylist), ("k_live_",)),
    Detector("openai_key", tuple(openai.OpenAIDetector.denylist), ("T3BlbkFJ",)),
    Detector("npm_token", tuple(npm.NpmDetector.denylist), (":_authToken",), group=1),
    Detector("pypi_token", tuple(pypi_token.PypiTokenDetector.denylist), ("pypi-AgE",)),
    Detector("sendgrid_key", tuple(sendgrid.SendGridDetector.denylist), ("SG.",)),
    Detector("azure_storage_key", tuple(azure_storage_key.AzureStorageKeyDetector.denylist),
             ("AccountKey=",)),
    Detector("square_token", tuple(square_oauth.SquareOAuthDetector.denylist), ("sq0csp-",)),
    Detector("google_api_key", (re.compile(r"AIza[0-9A-Za-z_-]{35}"),), ("AIza",)),
    Detector("jwt", tuple(jwt.JwtTokenDetector.denylist), ("eyJ",), valid=_jwt),
    Detector("basic_auth", tuple(basic_auth.BasicAuthDetector.denylist), ("://",), group=1),
    Detector("assigned_secret", (_QUOTED, _BARE),
             ("passw", "pwd", "secret", "token", "apikey", "api_key", "api-key", "accesskey",
              "access_key", "access-key", "authkey", "auth_key", "auth-key", "privatekey",
              "private_key", "private-key", "credential"), folded=True,
             valid=_random_looking, group=None),
)

_KEY_BLOCK = re.compile(  # the body alone goes; a header with no key after it stays
    r"-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?)-----"
    r"([A-Za-z0-9+/=\s:,.\\-]{0,16384}?)-----END \1-----"  # whole, or JSON-escaped ("\n")
    r"|-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"  # cut off: its base64 lines
    r"(\r?\n[ \t]*[A-Za-z0-9+/=]{16,}[ \t]*"
    r"(?:\r?\n[ \t]*[A-Za-z0-9+/=]+[ \t]*(?=\r?\n|$))*)")
_PUTTY_KEY = re.compile(r"(?m)^PuTTY-User-Key-File-\d: .{0,16384}?^Private-MAC: .*$", re.S)


def redact(text: str) -> tuple[str, Counter[str]]:
    """``text`` with every secret value replaced by ``[REDACTED:kind]`` (a key block's
    lines each by one), and how many of each kind were replaced."""
    spans: list[tuple[int, int, str]] = []
    if "PRIVATE KEY" in text:
        spans += [(m.start(g), m.end(g), "private_key") for m in _KEY_BLOCK.finditer(text)
                  if (g := m.lastindex or 0) > 1 and m.end(g) > m.start(g)]
    if "PuTTY-User-Key-File" in text:
        spans += [(m.start(), m.end(), "private_key") for m in _PUTTY_KEY.finditer(text)]
    for detector, lines in _TRIGGERS.candidates(text).items():
        for start in sorted(lines):
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
            for pattern in detector.patterns:
                for match in pattern.finditer(text, start, end):
                    group = (match.lastindex or 0) if detector.group is None else detector.group
                    value = match.group(group)
                    if value and (detector.valid is None or detector.valid(value)):
                        spans.append((match.start(group), match.end(group), detector.kind))
    if not spans:
        return text, Counter()
    return _replace(text, spans)


class _Triggers:
    """Every detector's triggers in two Aho-Corasick automata (one over the text, one
    over it lower-cased): one pass each over a file finds the lines to run the
    detectors' regexes on, where one ``str.find`` per trigger took 30."""

    def __init__(self, detectors: tuple[Detector, ...]) -> None:
        self._owners: list[list[list[Detector]]] = [[], []]
        automata = []
        for folded in (False, True):
            words: dict[str, list[Detector]] = {}
            for detector in detectors:
                if detector.folded == folded:
                    for trigger in detector.triggers:
                        words.setdefault(trigger, []).append(detector)
            self._owners[folded] = list(words.values())
            automata.append(AhoCorasick(list(words)))
        self._automata = automata

    def candidates(self, text: str) -> dict[Detector, set[int]]:
        """The start offsets of the lines holding each detector's triggers."""
        found: dict[Detector, set[int]] = defaultdict(set)
        for folded, automaton in enumerate(self._automata):
            haystack = _folded(text) if folded else text
            owners = self._owners[folded]
            for word, at, _ in automaton.find_matches_as_indexes(haystack, overlapping=True):
                line = text.rfind("\n", 0, at) + 1
                for detector in owners[word]:
                    found[detector].add(line)
        return found


_TRIGGERS = _Triggers(DETECTORS)


def _folded(text: str) -> str:
    """``text`` lower-cased, each character at its own offset (``str.lower`` lengthens
    a few, such as "İ"; those become "?" first)."""
    folded = text.lower()
    if len(folded) != len(text):
        folded = text.encode("ascii", "replace").decode("ascii").lower()
    return folded


def _replace(text: str, spans: list[tuple[int, int, str]]) -> tuple[str, Counter[str]]:
    """Spans replaced (overlapping ones merged, the first one's kind kept); newlines
    inside a span are kept, so every line stays where it was."""
    out: list[str] = []
    found: Counter[str] = Counter()
    cursor = 0
    for start, end, kind in sorted(spans):
        if end <= cursor:
            continue
        start = max(start, cursor)
        out.append(text[cursor:start])
        marker = f"[REDACTED:{kind}]"
        out.append("\n".join(marker if part.strip() else part
                             for part in text[start:end].split("\n")))
        found[kind] += 1
        cursor = end
    out.append(text[cursor:])
    return "".join(out), found


# -- files that are secrets by nature -------------------------------------------------
_KEY_FILES = re.compile(r"id_(rsa|dsa|ecdsa|ed25519)(_sk)?(\.pub|-cert\.pub|\.bak|\.old)?"
                        r"|.*\.(p12|pfx|jks|keystore|ppk)")
_ENV_TEMPLATES = {"example", "sample", "template", "dist", "defaults"}
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?[\w.-]+\s*=\s*(.*?)\s*$")
_CONTENT_RULES: dict[str, re.Pattern[str]] = {
    ".npmrc": re.compile(r"_authToken|_auth\s*=|_password\s*="),
    ".pypirc": re.compile(r"(?m)^\s*password\s*[=:]"),
    ".netrc": re.compile(r"\bpassword\s+\S"),
    "_netrc": re.compile(r"\bpassword\s+\S"),
    "credentials": re.compile(r"(?i)aws_secret_access_key|aws_session_token|password"),
}
_CLOUD_JSON = re.compile(r'"(private_key|client_secret|refresh_token)"\s*:\s*"[^"]')
_KUBECONFIG = re.compile(r"(?m)^kind:\s*Config\s*$")
_KUBE_SECRET = re.compile(r"(?m)^\s*(token|client-key-data|password|auth-provider):")


def secret_name(path: str) -> bool:
    """Whether the file at ``path`` is a secret by its name alone (a private key, a
    key store, a ``.env`` or a ``.git-credentials``); ``.env`` templates are judged
    by their content (``secret_file``)."""
    name = PurePosixPath(path).name
    if name == ".git-credentials" or _KEY_FILES.fullmatch(name):
        return True
    return (name == ".env" or name.startswith(".env.")) and not _env_template(name)


def _env_template(name: str) -> bool:
    return name.rsplit(".", 1)[-1].lower() in _ENV_TEMPLATES


def secret_file(path: str, text: str) -> bool:
    """Whether the file at ``path`` holding ``text`` is a secret as a whole: a key
    file with a key block, a credentials or config file holding tokens or passwords,
    a ``.env`` template with values filled in."""
    pure = PurePosixPath(path)
    name, suffix = pure.name, pure.suffix.lower()
    if secret_name(path):
        return True
    if name.startswith(".env."):  # a template: only its keys, no values, may be indexed
        return any((m := _ASSIGNMENT.match(line)) and m.group(1).strip("\"'")
                   for line in text.splitlines() if not line.lstrip().startswith("#"))
    if suffix in (".pem", ".key") and ("PRIVATE KEY-----" in text or "PuTTY-User-Key" in text):
        return True
    rule = _CONTENT_RULES.get(name)
    if rule is not None and rule.search(text):
        return True
    if suffix == ".json" and ("credential" in name.lower() or name.startswith("client_secret")
                              or '"service_account"' in text) and _CLOUD_JSON.search(text):
        return True
    kube = pure.parent.name == ".kube" or name.startswith("kubeconfig")
    return (kube or suffix in (".yaml", ".yml", "")) and bool(
        _KUBECONFIG.search(text) and _KUBE_SECRET.search(text))
