"""What each command prints, as a person sees it: on a pseudo-terminal (live progress,
tables) and piped (plain lines for logs). Every case also checks that nothing leaks
into the output that should not: tracebacks, Lance's log lines, markup lost as tags."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ssindex.backends.calibration import CALIBRATION_FILE, machine_key
from ssindex.backends.inventory import detect

from .conftest import CLI, STDLIB, run_cli, run_tty

pytestmark = pytest.mark.slow

NONSENSE = "purple monkey dishwasher"


def _clean(text: str) -> None:
    """Output a user should never see."""
    for unwanted in ("Traceback", "WARN", "MarkupError"):
        assert unwanted not in text, text


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "tree"
    (root / "json").mkdir(parents=True)
    for name in ("decoder.py", "scanner.py", "encoder.py"):
        shutil.copy(STDLIB / "json" / name, root / "json" / name)
    return root


@pytest.fixture(scope="module")
def built(tree: Path) -> Path:
    """A clean first build on a terminal: live progress per stage, then the summary."""
    code, screen = run_tty("build", str(tree))
    assert code == 0, screen
    _clean(screen)
    for stage in ("walk", "chunk", "embed"):
        assert stage in screen
    for row in ("ssindex build", "3 indexed of 3 seen", "0 changed, 3 new", "backend",
                "all-MiniLM-L6-v2@", "int8 (388 B/vector)", "(version 1)"):
        assert row in screen, screen
    return tree / ".ssindex"


def test_incremental_build_piped_prints_plain_progress_and_the_summary(
        built: Path, tree: Path) -> None:
    decoder = tree / "json" / "decoder.py"
    decoder.write_text(decoder.read_text() + "\n\ndef added_helper():\n    return 1\n")
    result = run_cli("build", str(tree))
    _clean(result.stdout + result.stderr)
    assert "\x1b" not in result.stdout + result.stderr
    assert result.stderr.startswith("progress:"), result.stderr
    summary = " ".join(result.stdout.split())
    assert "1 changed, 0 new, 0 removed" in summary and "1 embedded" in summary, summary


def test_a_pass_that_embeds_nothing_reports_its_rows_written_not_embedded(
        tree: Path, tmp_path: Path) -> None:
    """A progressive first build's lexical pass, then its embedding pass, piped; and a
    ``--no-embed`` build on a terminal. Rows without vectors once showed as "embed
    N/N" at a rate no model reaches."""
    config = tmp_path / "progressive.toml"
    config.write_text("[commit]\nmin_files = 0\n")
    result = subprocess.run([CLI, "build", str(tree), "--index", str(tmp_path / "both"),
                             "--config", str(config)], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "SSINDEX_PROGRESS_SECONDS": "0"})
    assert result.returncode == 0, result.stderr
    _clean(result.stderr)
    lexical, _, embedding = result.stderr.partition("searchable now")
    assert embedding, result.stderr
    lexical_lines = [line for line in lexical.splitlines() if line.startswith("progress:")]
    assert lexical_lines and all(" | write " in line for line in lexical_lines), lexical
    assert lexical_lines[-1].split(" | write ")[1].startswith(
        "{0}/{0} ".format(lexical_lines[-1].split(" | chunk ")[1].split()[0]))
    assert " | embed " in embedding and " | write " not in embedding, embedding
    code, screen = run_tty("build", str(tree), "--index", str(tmp_path / "lexical"),
                           "--no-embed")
    assert code == 0, screen
    _clean(screen)
    last = screen.split("ssindex build")[0].rpartition("walk ")[2]  # the final frame
    assert "write" in last and "embed" not in last, screen


def test_check_says_current_or_stale_on_a_terminal_and_piped(built: Path, tree: Path) -> None:
    piped = run_cli("build", str(tree), "--check", check=False)
    assert (piped.returncode, piped.stdout.strip(), piped.stderr) == (0, "current", "")
    (tree / "json" / "new.py").write_text("def fresh():\n    return 2\n")
    code, screen = run_tty("build", str(tree), "--check")
    assert (code, screen.strip()) == (1, "stale: 1 file(s) new"), screen
    (tree / "json" / "new.py").unlink()


def test_an_auto_mode_fallback_is_shown_with_its_reason(tmp_path: Path, tree: Path) -> None:
    """A calibrated winner that cannot run on this kind of machine is skipped visibly: a
    warning while building, the reason in the summary's backend row. The winner is the
    GPU backend this platform lacks: Apple's MPS off macOS, CUDA on macOS."""
    missing = "torch-cuda" if sys.platform == "darwin" else "torch-mps"
    config = tmp_path / "config"
    config.mkdir()
    record = {"machine": machine_key(detect()), "phases": {
        "embed_bulk": {"backend": missing, "figure": "9000 chunks/s"}}}
    (config / CALIBRATION_FILE).write_text(json.dumps(record))
    root = tmp_path / "tree"
    shutil.copytree(tree / "json", root / "json")
    env = {"SSINDEX_CONFIG_DIR": str(config)}
    code, screen = run_tty("build", str(root), env=env)
    assert code == 0, screen
    _clean(screen)
    assert f"embed_bulk: {missing} could not run" in screen and "falling back" in screen
    assert f"[fallback: {missing} unavailable" in screen, screen
    piped = subprocess.run([CLI, "build", str(root), "--index", str(tmp_path / "piped")],
                           capture_output=True, text=True, env={**os.environ, **env},
                           timeout=1800)
    assert piped.returncode == 0, piped.stderr
    assert f"warning: embed_bulk: {missing} could not run" in piped.stderr
    # the row wraps where the reason's length puts it: read it without the table's borders
    assert f"[fallback: {missing} unavailable" in " ".join(piped.stdout.replace("│", " ").split())


def test_search_prints_hits_abstention_and_missing_index(built: Path, tmp_path: Path) -> None:
    code, screen = run_tty("search", "decode a json document", "--index", str(built), "-k", "3")
    assert code == 0, screen
    _clean(screen)
    assert screen.startswith(" 1. json/"), screen
    assert " 3. json/" in screen and " 4. " not in screen
    piped = run_cli("search", "decode a json document", "--index", str(built), "-k", "3")
    assert piped.stdout.splitlines()[0].startswith(" 1. json/decoder.py:"), piped.stdout
    assert "\x1b" not in piped.stdout and piped.stderr == ""

    code, screen = run_tty("search", NONSENSE, "--index", str(built))
    assert code == 0 and "nothing relevant in this index (abstained" in screen, screen

    missing = run_cli("search", "x", "--index", str(tmp_path / "none"), check=False)
    assert missing.returncode == 3 and missing.stdout == ""
    assert missing.stderr.startswith("error: no index") and missing.stderr.count("\n") == 1


def test_search_explain_shows_each_factor_and_adds_up(built: Path) -> None:
    """``--explain`` on a terminal and in ``--json``: the legs, the fused score, every
    factor and added term, and together they make the result's score."""
    code, screen = run_tty("search", "JSONDecoder", "--index", str(built), "-k", "3",
                           "--explain")
    assert code == 0, screen
    _clean(screen)
    assert screen.startswith(" 1. json/decoder.py:"), screen
    assert "fused " in screen and "defines" in screen, screen
    results = json.loads(run_cli("search", "JSONDecoder", "--index", str(built), "-k", "3",
                                 "--explain", "--json").stdout)["results"]
    for hit in results:
        why = hit["explain"]
        assert set(why) == {"dense", "lexical", "fused", "factors", "added"}
        factors = dict(why["factors"])
        decay = factors.pop("same file", 1.0)
        score = why["fused"]
        for value in factors.values():
            score *= value
        score = (score + sum(why["added"].values())) * decay
        assert abs(score - hit["score"]) < 1e-3 * max(1.0, hit["score"]), hit
    results = json.loads(run_cli("search", "how a json document is decoded", "--index",
                                 str(built), "--explain", "--json").stdout)["results"]
    assert any(hit["explain"]["added"].get("file evidence") for hit in results)


def test_status_and_doctor_print_their_facts(built: Path) -> None:
    code, screen = run_tty("status", "--index", str(built))
    assert code == 0, screen
    for key in ("index", "files", "chunks", "model", "table_version", "built_at"):
        assert any(line.startswith(key) for line in screen.splitlines()), (key, screen)
    piped = run_cli("status", "--index", str(built))
    assert piped.stdout.splitlines()[1].split() == ["files", "3"], piped.stdout
    facts = dict(line.split(None, 1) for line in piped.stdout.splitlines())
    assert facts["dense_coverage"] == "1.0" and facts["build"] == "none", piped.stdout
    assert "{" not in piped.stdout and "None" not in piped.stdout, piped.stdout

    code, screen = run_tty("doctor")
    assert code == 0, screen
    _clean(screen)
    for row in ("ssindex doctor", "CPU", "torch", "onnxruntime", "embed_bulk", "embed_query"):
        assert row in screen, screen


def test_eval_prints_a_table_of_every_mode(tmp_path: Path) -> None:
    data = tmp_path / "beir"
    data.mkdir()
    docs = {"d1": "def parse_config(path):\n    return json.load(open(path))\n",
            "d2": "def send_mail(to, body):\n    smtp.sendmail(to, body)\n"}
    (data / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in docs.items()))
    (data / "queries.jsonl").write_text(
        json.dumps({"_id": "q1", "text": "read a configuration file"}) + "\n"
        + json.dumps({"_id": "q2", "text": ""}) + "\n")
    (data / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    code, screen = run_tty("eval", str(data), "--workdir", str(tmp_path / "work"))
    assert code == 0, screen
    _clean(screen)
    for word in ("mrr@10", "lexical", "semantic", "hybrid", "1 judged queries have no text"):
        assert word in screen, screen


def test_serve_announces_itself_on_stderr_only(built: Path) -> None:
    proc = subprocess.Popen([CLI, "serve", "--index", str(built)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdin is not None
        line = proc.stderr.readline()
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0
        assert proc.stdout is not None and proc.stdout.read() == ""
    finally:
        proc.kill()
    assert line.startswith(f"ssindex serve: {built} (") and "MCP over stdio" in line, line


def test_help_shows_extras_and_brackets_verbatim() -> None:
    commands = ["build", "search", "status", "serve", "eval", "calibrate", "doctor"]
    top = run_cli("--help").stdout
    for command in commands:
        assert command in top
        text = " ".join(run_cli(command, "--help").stdout.split())
        assert "Usage: ssindex " + command in text
        assert "needs ssindex)" not in text  # markup would have eaten "[serve]"
    serve = " ".join(run_cli("serve", "--help").stdout.split())
    assert "(needs ssindex[serve])" in serve
    build = " ".join(run_cli("build", "--help").stdout.split())
    assert "PHASE=NAME" in build and "s3://bucket/prefix" in build


def test_version_names_the_package_and_the_model() -> None:
    from ssindex import __version__

    out = run_cli("--version").stdout
    assert out.startswith(f"ssindex {__version__}, model all-MiniLM-L6-v2@"), out


@pytest.mark.parametrize("args", [
    ("search",), ("search", "x", "--bogus"), ("search", "x", "-k", "many"), ("buidl", "."),
])
def test_usage_errors_are_one_line_and_a_hint(args: tuple[str, ...]) -> None:
    result = run_cli(*args, check=False)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: see 'ssindex")
    assert "╭" not in result.stderr
