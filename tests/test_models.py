"""Bring your own model: the sentence-transformers contract, architectures, prompts,
Matryoshka dims, remote code, and chunks cut to the model's window.

Every model here is real: made by ``tiny_models`` from a config, random weights in
safetensors and the bundled model's tokenizer. References are computed with
transformers and numpy directly, not through ssindex."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ssindex.backends.base import Encoder
from ssindex.backends.counter import TokenCounter
from ssindex.backends.model import ModelSpec
from ssindex.backends.onnx_backend import OnnxBackend
from ssindex.backends.torch_backend import SDPA_MASKED, TorchBackend
from ssindex.config import BuildConfig, ChunkConfig, EmbedConfig
from ssindex.errors import ConfigError
from ssindex.pipeline.build import build
from ssindex.query.searcher import Searcher
from ssindex.records import SourceFile, Tokens
from ssindex.stages.chunk import chunk_file
from ssindex.stages.embed import ModelWindow, embedding_text
from ssindex.stages.lines import text_rows
from tests.conftest import STDLIB, run_cli
from tests.tiny_models import ARCHITECTURES, make_model

TEXTS = ["def parse(text):\n    return json.loads(text)", "class Server:\n    pass",
         "read a file line by line " * 6, "x"]  # each within the 64-token window


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _token_states(model: Path, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token states and mask of ``texts`` straight from transformers (right-padded)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    batch = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.inference_mode():
        hidden = AutoModel.from_pretrained(model)(input_ids=batch["input_ids"],
                                                   attention_mask=batch["attention_mask"])
    return hidden.last_hidden_state.numpy(), batch["attention_mask"].numpy()


def _reference_pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    weights = mask[:, :, None].astype(np.float32)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return np.where(weights > 0, hidden, -np.inf).max(axis=1)
    if mode == "mean":
        return (hidden * weights).sum(1) / weights.sum(1)
    if mode == "mean_sqrt_len":
        return (hidden * weights).sum(1) / np.sqrt(weights.sum(1))
    if mode == "weightedmean":
        positions = weights * np.arange(1, hidden.shape[1] + 1)[None, :, None]
        return (hidden * positions).sum(1) / positions.sum(1)
    last = mask.sum(1) - 1
    return hidden[np.arange(len(hidden)), last]


def _encode(spec: ModelSpec, texts: list[str], role: str = "document") -> np.ndarray:
    return Encoder(TorchBackend(spec), spec, role=role).encode(texts)


@pytest.mark.parametrize("mode", ["cls", "mean", "max", "lasttoken", "weightedmean"])
def test_each_pooling_matches_a_reference(tmp_path: Path, mode: str) -> None:
    model = make_model(tmp_path / "m", pooling=mode, normalize=False)
    hidden, mask = _token_states(model, TEXTS)
    expected = _unit(_reference_pool(hidden, mask, mode))
    got = _encode(ModelSpec.resolve(model), TEXTS)
    assert np.allclose(got, expected, atol=1e-5)


def test_dense_and_normalize_are_applied(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    model = make_model(tmp_path / "m", dense=(16,))
    spec = ModelSpec.resolve(model)
    assert spec.dim == 16 and spec.card.modules[-1] == "normalize"
    hidden, mask = _token_states(model, TEXTS)
    weights = load_file(model / "2_Dense" / "model.safetensors")
    pooled = _reference_pool(hidden, mask, "mean")
    expected = _unit(np.tanh(pooled @ weights["linear.weight"].T + weights["linear.bias"]))
    assert np.allclose(_encode(spec, TEXTS), expected, atol=1e-5)


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_onnx_agrees_with_torch_per_architecture(tmp_path: Path, architecture: str) -> None:
    spec = ModelSpec.resolve(make_model(tmp_path / architecture, architecture, dense=(24,)))
    torch_vectors = _encode(spec, TEXTS)
    onnx_vectors = Encoder(OnnxBackend(spec), spec).encode(TEXTS)
    assert torch_vectors.shape == (len(TEXTS), 24)
    assert float((torch_vectors * onnx_vectors).sum(1).min()) >= 0.999


@pytest.mark.parametrize("architecture", sorted(SDPA_MASKED))
def test_masks_made_ready_for_sdpa_give_the_vectors_of_transformers_masks(
        tmp_path: Path, architecture: str) -> None:
    """On CUDA the mask goes to these models ready for SDPA (no host sync per batch);
    checked here on the CPU, on a padded batch and on one without padding."""
    spec = ModelSpec.resolve(make_model(tmp_path / architecture, architecture))
    backend = TorchBackend(spec, "cpu", "fp32")
    assert not backend.host_masks  # on the CPU, transformers' own masks
    encoder = Encoder(backend, spec)
    padded, whole = TEXTS, [TEXTS[1]] * 3
    expected = [encoder.encode(texts) for texts in (padded, whole)]
    backend.host_masks = True
    for texts, vectors in zip((padded, whole), expected, strict=True):
        assert np.allclose(encoder.encode(texts), vectors, atol=1e-6), architecture


def test_compile_covers_both_masks_of_a_cuda_pass(tmp_path: Path) -> None:
    """With masks made ready for SDPA (CUDA), a batch without padding passes no mask and a
    padded one a boolean mask: two graphs. ``compile`` builds both, so no real batch
    compiles again (on a GPU that cost a second full compile outside the one timed)."""
    from torch._dynamo.utils import counters

    spec = ModelSpec.resolve(make_model(tmp_path / "bert", "bert"))
    backend = TorchBackend(spec, "cpu", "fp32")
    backend.host_masks = True
    encoder = Encoder(backend, spec)
    eager = [encoder.encode(texts) for texts in (TEXTS, [TEXTS[1]] * 3)]
    backend.compile()
    compiled = counters["stats"]["unique_graphs"]
    for texts, vectors in zip((TEXTS, [TEXTS[1]] * 3), eager, strict=True):
        assert np.allclose(encoder.encode(texts), vectors, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == compiled


def test_a_model_saved_in_bf16_runs_in_float32_on_the_fp32_backends(tmp_path: Path) -> None:
    """Many models ship bf16 weights: the fp32 backends and the ONNX export upcast them
    (left in bf16, ONNX Runtime's CPU kernels refused the graph)."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = make_model(tmp_path / "bf16")
    weights = load_file(folder / "model.safetensors")
    save_file({name: tensor.to(torch.bfloat16) for name, tensor in weights.items()},
              folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config.pop("torch_dtype", None)
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    spec = ModelSpec.resolve(folder)
    backend = TorchBackend(spec, "cpu", "fp32")
    assert {p.dtype for p in backend._module.parameters()} == {torch.float32}
    onnx_vectors = Encoder(OnnxBackend(spec), spec).encode(TEXTS)
    assert float((Encoder(backend, spec).encode(TEXTS) * onnx_vectors).sum(1).min()) >= 0.999


def test_prompts_reach_the_tokenizer_at_build_and_at_search(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m", prompts={"query": "query: ", "document": "passage: "})
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "parse.py").write_text("def parse(text):\n    return json.loads(text)\n")
    # fp32 weights: auto mode takes bf16 on AMX/AVX512-BF16 CPUs, off the reference by ~1e-3
    build(tree, tmp_path / "index", BuildConfig(quantization="none",
                                                embed=EmbedConfig(model=str(model)),
                                                backends=(("embed_bulk", "torch-cpu-fp32"),)))
    searcher = Searcher(tmp_path / "index")
    stored = searcher.dense.vectors()[0]
    text = searcher.rows.column("text")[0].as_py()
    hidden, mask = _token_states(model, ["passage: " + text, text, "query: json", "json"])
    reference = _unit(_reference_pool(hidden, mask, "mean"))
    assert np.allclose(stored, reference[0], atol=1e-5)
    assert not np.allclose(stored, reference[1], atol=1e-3)  # the prompt changed the vector
    query = searcher.embed_query("json")  # on the query backend: int8 weights
    assert float(query @ reference[2]) >= 0.9999 > float(query @ reference[3])


def test_dims_truncate_and_renormalize(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    full = _encode(ModelSpec.resolve(model), TEXTS)
    short = _encode(ModelSpec.resolve(model, dims=8), TEXTS)
    assert short.shape == (len(TEXTS), 8)
    assert np.allclose(short, _unit(full[:, :8]), atol=1e-6)
    with pytest.raises(ConfigError, match="--dims 64: m has 32 dimensions"):
        ModelSpec.resolve(model, dims=64)


def _custom_code_model(target: Path) -> Path:
    """A BERT whose class lives in the model directory's own code (``auto_map``)."""
    make_model(target)
    config = json.loads((target / "config.json").read_text())
    config.update(model_type="ssindex-tiny-custom", architectures=["TinyCustomModel"],
                  auto_map={"AutoConfig": "configuration_tiny.TinyCustomConfig",
                            "AutoModel": "modeling_tiny.TinyCustomModel"})
    (target / "config.json").write_text(json.dumps(config))
    (target / "configuration_tiny.py").write_text(
        "from transformers import BertConfig\n\n\nclass TinyCustomConfig(BertConfig):\n"
        "    model_type = 'ssindex-tiny-custom'\n")
    (target / "modeling_tiny.py").write_text(
        "from transformers import BertModel\n\nfrom .configuration_tiny import TinyCustomConfig"
        "\n\n\nclass TinyCustomModel(BertModel):\n    config_class = TinyCustomConfig\n")
    return target


def test_remote_code_is_refused_unless_trusted_at_build_and_search(tmp_path: Path) -> None:
    model = _custom_code_model(tmp_path / "custom")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text("def load_settings(path):\n    return open(path).read()\n")
    index = str(tmp_path / "index")
    refused = run_cli("build", str(tree), "--index", index, "--model", str(model), check=False)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        "error: custom runs its own code (modeling_tiny.TinyCustomModel); pass "
        "--trust-remote-code to allow it"]
    run_cli("build", str(tree), "--index", index, "--model", str(model), "--trust-remote-code")
    untrusted = run_cli("search", "settings", "--index", index, "--mode", "semantic",
                        check=False)
    assert untrusted.returncode != 0 and "--trust-remote-code" in untrusted.stderr
    found = run_cli("search", "settings", "--index", index, "--mode", "semantic",
                    "--trust-remote-code", "--format", "files", "--no-abstain")
    assert found.stdout.split() == [str(tree / "a.py")]


def test_a_changed_prompt_re_embeds(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m", prompts={"query": "query: ", "document": "passage: "})
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("a", "b"):
        (tree / f"{name}.py").write_text(f"def {name}_load(path):\n    return path\n")
    cfg = BuildConfig(embed=EmbedConfig(model=str(model)))
    first = build(tree, tmp_path / "index", cfg)
    again = build(tree, tmp_path / "index", cfg)
    assert first["chunks_embedded"] == 2 and again["chunks_embedded"] == 0
    (model / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "document": "code: "}}))
    changed = build(tree, tmp_path / "index", cfg)
    assert changed["chunks_embedded"] == 2 and changed["chunks_reused"] == 0


def test_settings_file_gives_prompts_pooling_and_window(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m", max_seq_length=None)
    for name in ("modules.json", "1_Pooling/config.json"):
        (model / name).unlink()
    assert ModelSpec.resolve(model).card.pooling == ("mean",)
    assert ModelSpec.resolve(model).window == 128  # the model's positions
    (model / "ssindex-model.toml").write_text(
        'pooling = "cls"\nquery_prompt = "q: "\ndocument_prompt = "d: "\nwindow = 32\n')
    spec = ModelSpec.resolve(model)
    card: dict[str, Any] = spec.card.as_json()
    assert (card["pooling"], card["query_prompt"], card["document_prompt"], spec.window) == (
        "cls", "q: ", "d: ", 32)
    (model / "ssindex-model.toml").write_text('pooling = "cls"\nprompt = "q: "\n')
    with pytest.raises(ConfigError, match="unknown settings prompt"):
        ModelSpec.resolve(model)


def test_chunks_fit_the_window_and_cover_the_file(tmp_path: Path) -> None:
    """A function far longer than a 64-token window is cut along its statements, then
    lines: no chunk is truncated and every line lands in exactly one chunk."""
    body = "".join(f"    value_{i} = compute_something(value_{i - 1}, factor={i})  # step {i}\n"
                   for i in range(1, 120))
    text = f"def long_function(value_0):\n{body}    return value_119\n"
    source = SourceFile("long.py", "python", text, len(text), 0, "hash")
    spec = ModelSpec.resolve(make_model(tmp_path / "m"))
    window = ModelWindow(spec)
    plain, _ = chunk_file(source, ChunkConfig())
    fitted, chunker = chunk_file(source, ChunkConfig(), window)
    assert chunker == "ast"
    assert any(t.truncated for t in window.measure(plain))
    assert not any(t.truncated for t in window.measure(fitted))
    rows = [row for c in fitted for row in range(c.start_line, c.end_line + 1)]
    assert rows == list(range(1, text.count("\n") + 1))
    assert all(c.symbol == "long_function" for c in fitted)


HOSTILE = ["", " \n ", "[SEP] between [cls] words[MASK]", "naïve café Ångström", "中文字符 한국어",
           "tab\tvertical\x0bfeed\x0cfile\x1csep\x1fnext\x85nbsp\xa0ideographic\u3000space",
           "zero\u200bwidth\ufeffbom\ufffdreplacement", "ﬁligature ½ ² ①", "emoji 😀 done",
           "greek\u037equestion \u1fefvaria", "combining .\u0301 e\u0301 a" + "\u0301" * 40,
           "x" * 150, "CamelCase_snake 0x1F 3.14e-10", "\x00null\x7fdel\r\n"]


def _fuzz(count: int) -> list[str]:
    """Random strings over code, punctuation, and the characters tokenizers disagree on."""
    alphabet = list("abcXYZ019 _.,;:()[]{}'\"\t\n\r#-+=*/\\") + list(
        "\x00\x01\x0b\x1f\x7f\x85\xa0\u2003\u200b\ufeff\ufffd\u037e\u0301éÅ\u212b中한ﬁ½😀\u00ad’—")
    rng = np.random.default_rng(7)
    return ["".join(rng.choice(alphabet, rng.integers(1, 300))) for _ in range(count)]


def test_token_counts_are_the_tokenizers_own() -> None:
    """The chunker's counts (lines and words counted once, remembered) are exactly the
    tokenizer's: on real code, hostile and random text, for the bundled BERT tokenizer,
    a byte-level BPE one, and one with tokens added (the last two counted whole)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

    code = [path.read_text() for path in sorted((STDLIB / "json").glob("*.py"))]
    texts = code + [line for text in code for line in text.splitlines()] + HOSTILE
    texts += ["\n".join(HOSTILE), " ".join(HOSTILE), *_fuzz(2000)]
    texts += ["<CODE> and <co\x00de> and <code>", "foo\tbar", "foo bar"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(code, trainers.BpeTrainer(vocab_size=400))
    added = ModelSpec.resolve(None).tokenizer()  # tokens matched after normalization
    added.add_tokens([AddedToken("<code>", normalized=True), AddedToken("foo bar")])
    texts_bert = ModelSpec.resolve(None).tokenizer()
    for tokenizer in (texts_bert, bpe, added):
        whole = Tokenizer.from_str(tokenizer.to_str())
        whole.no_truncation()
        expected = [len(e.ids) for e in whole.encode_batch(texts, add_special_tokens=False)]
        counter = TokenCounter(tokenizer)
        assert counter(texts) == expected
        assert counter(texts[::-1]) == expected[::-1]  # now from what it remembers
        forgetful = TokenCounter(tokenizer)
        forgetful.REMEMBERED = 16  # forgets as it goes
        assert [n for i in range(0, len(texts), 50) for n in forgetful(texts[i:i + 50])] \
            == expected
        ids = [e.ids for e in whole.encode_batch(texts, add_special_tokens=False)]
        joined = counter.ids(texts)
        assert all(cut is None or cut.tolist() == own for cut, own in zip(joined, ids, strict=True))
        # the BERT tokenizer joins every text's ids but the three that hold "[SEP]"
        assert sum(cut is None for cut in joined) == (
            3 if tokenizer is texts_bert else len(texts))


def test_chunks_are_cut_into_the_tokenizers_own_tokens(tmp_path: Path) -> None:
    """The embed stage's tokens (joined from remembered lines' ids where a chunk fits the
    window, or sliced from its file's rows') are the tokenizer's, special tokens and
    windows included; so are the counts that decide what fits, with a prompt too."""
    window = ModelWindow(ModelSpec.resolve(None))
    # a prompt without a trailing space runs into the text's first word
    prompted = ModelWindow(ModelSpec.resolve(make_model(
        tmp_path / "m", prompts={"document": "passage"}, max_seq_length=None)))
    texts = [path.read_text() for path in sorted((STDLIB / "email").glob("*.py"))]
    texts += ["\n".join(HOSTILE), *HOSTILE, *_fuzz(300), "[SEP]\n" + texts[0]]
    files = [(text_rows(text), chunk_file(SourceFile(f"f{i}.py", "python", text, len(text), 0,
                                                     str(i)), ChunkConfig())[0])
             for i, text in enumerate(texts)]
    chunks = [c for _, cut in files for c in cut]
    assert any(t.truncated for t in window.measure(chunks))  # not fitted: some are long
    assert any(embedding_text(c) != c.text for c in chunks)  # some under a header
    from_rows = [t for rows, cut in files for t in window.tokens(cut, rows)]
    for whole, by_rows, own in zip(window.tokens(chunks), from_rows, window.measure(chunks),
                                   strict=True):
        for cut in (whole, by_rows):
            assert cut is not None
            assert cut.ids.dtype == own.ids.dtype and np.array_equal(cut.ids, own.ids)
            assert cut.truncated == own.truncated
            assert [r.tolist() for r in cut.rest] == [r.tolist() for r in own.rest]
    for measuring in (window, prompted):
        fits = [not t.truncated for t in measuring.measure(chunks)]
        assert 0 < sum(fits) < len(fits)
        assert measuring.fits(chunks) == fits
        assert [fit for rows, cut in files for fit in measuring.fits(cut, rows)] == fits


def test_a_text_longer_than_the_window_is_read_window_by_window(tmp_path: Path) -> None:
    spec = ModelSpec.resolve(make_model(tmp_path / "m"))  # a 64-token window
    encoder = Encoder(TorchBackend(spec), spec)
    tokens = encoder.tokenize(["tokens " * 150])[0]
    assert tokens.truncated and tokens.rest
    pieces = [tokens.ids, *tokens.rest]
    windows = encoder.encode_tokens([Tokens(piece, False) for piece in pieces])
    expected = _unit((windows * np.array([[len(p)] for p in pieces])).sum(0, keepdims=True))
    assert np.allclose(encoder.encode(["tokens " * 150]), expected, atol=1e-6)
    assert (encoder.stats.truncated, encoder.stats.windowed) == (0, 1)


def test_doctor_prints_what_it_understood_of_the_model(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m", "roberta", pooling="max", dense=(16,),
                       prompts={"query": "query: ", "document": "passage: "})
    report = json.loads(run_cli("doctor", "--model", str(model), "--json").stdout)
    card = report["card"]
    assert (card["architecture"], card["pooling"], card["query_prompt"], card["window"],
            card["dim"]) == ("RobertaModel", "max", "query: ", 64, 16)
    assert report["backends"]["torch-cpu-fp32"] == "runs"
    assert report["backends"]["onnx-cpu"] == "runs"


def test_coreml_converts_the_architectures_or_refuses_in_one_line(tmp_path: Path) -> None:
    """Core ML predicts only on macOS; its conversion runs anywhere and is checked here."""
    pytest.importorskip("coremltools", reason="the coreml extra is not installed")
    from ssindex.backends.coreml_backend import convert_coreml
    from ssindex.errors import BackendUnavailable

    converted, refused = [], []
    for architecture in sorted(ARCHITECTURES):
        spec = ModelSpec.resolve(make_model(tmp_path / architecture, architecture, dense=(24,)))
        try:
            assert convert_coreml(spec, tmp_path / f"{architecture}.mlpackage").is_dir()
            converted.append(architecture)
        except BackendUnavailable as exc:
            assert str(exc).startswith(f"coreml cannot convert {architecture} (")
            assert "\n" not in str(exc)
            refused.append(architecture)
    assert len(converted) >= 6, (converted, refused)
