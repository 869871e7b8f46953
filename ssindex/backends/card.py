"""What a model directory says about how to embed with it.

The sentence-transformers contract is honoured: ``modules.json`` (Transformer →
Pooling → Dense → Normalize), the pooling config, ``max_seq_length`` and the query
and document prompts of ``config_sentence_transformers.json``. A model without it
may carry an ``ssindex-model.toml`` (below); a plain transformers directory gets mean
pooling over its whole position range, with no prompts.

``ssindex-model.toml``, beside ``config.json``, overrides any of::

    pooling = "mean"          # cls | mean | max | lasttoken | weightedmean | mean_sqrt_len
    query_prompt = "query: "
    document_prompt = "passage: "
    window = 512              # tokens one text may take, the prompt and special tokens included
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssindex.errors import ConfigError

SETTINGS_FILE = "ssindex-model.toml"
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len", "weightedmean", "lasttoken")
"""In sentence-transformers' order: several modes are concatenated in this order."""
_ST_POOLING_KEYS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
                    "mean": "pooling_mode_mean_tokens",
                    "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
                    "weightedmean": "pooling_mode_weightedmean_tokens",
                    "lasttoken": "pooling_mode_lasttoken"}
_ST_MODULES = "sentence_transformers.models."
QUERY_PROMPT_NAMES = ("query", "search_query", "queries")
DOCUMENT_PROMPT_NAMES = ("document", "passage", "search_document", "corpus", "documents")
"""The prompt names models publish for each side of retrieval, in order of preference."""
OFFSET_POSITIONS = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "longformer": 2}
"""Position embeddings these architectures reserve for padding, beyond the usable window."""


@dataclass(frozen=True)
class Dense:
    """A sentence-transformers ``Dense`` module: ``activation(x @ W.T + b)``."""

    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str
    """``identity`` or ``tanh``."""


@dataclass(frozen=True)
class ModelCard:
    architecture: str
    model_type: str
    remote_code: str
    """The module of the model's own code (``auto_map``), or empty when transformers has it."""
    pooling: tuple[str, ...]
    query_prompt: str
    document_prompt: str
    window: int
    hidden_size: int
    modules: tuple[Dense | str, ...]
    """After pooling: ``Dense`` layers and ``"normalize"`` in order."""

    @property
    def dim(self) -> int:
        """The width of the vectors the model produces."""
        dense = [m for m in self.modules if isinstance(m, Dense)]
        return dense[-1].out_features if dense else self.hidden_size * len(self.pooling)

    def as_json(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "model_type": self.model_type,
                "remote_code": self.remote_code, "pooling": "+".join(self.pooling),
                "query_prompt": self.query_prompt, "document_prompt": self.document_prompt,
                "window": self.window, "dim": self.dim,
                "modules": [m if isinstance(m, str) else
                            f"dense {m.in_features}->{m.out_features} {m.activation}"
                            for m in self.modules]}


def read_card(path: Path, config: dict[str, Any]) -> ModelCard:
    """The card of the model at ``path`` (``config`` is its ``config.json``)."""
    settings = _settings_file(path)
    pooling: tuple[str, ...] = ("mean",)
    modules: list[Dense | str] = []
    for entry in _modules(path):
        kind = str(entry.get("type", "")).removeprefix(_ST_MODULES)
        folder = path / str(entry.get("path", ""))
        if kind == "Transformer":
            if entry.get("path"):
                raise ConfigError(f"{path.name}: a Transformer module in a subfolder "
                                  f"({entry['path']}) is not supported; point --model at it")
        elif kind == "Pooling":
            pooling = _st_pooling(folder)
        elif kind == "Dense":
            modules.append(_dense(folder))
        elif kind == "Normalize":
            modules.append("normalize")
        else:
            raise ConfigError(f"{path.name}: sentence-transformers module {kind!r} is not "
                              "supported (Transformer, Pooling, Dense and Normalize are)")
    if "pooling" in settings:
        pooling = (_pooling_mode(str(settings["pooling"]), path),)
    prompts = _st_config(path)
    query, document = _prompts(prompts)
    model_type = str(config.get("model_type", ""))
    return ModelCard(
        architecture=str((config.get("architectures") or [model_type])[0]),
        model_type=model_type, remote_code=_remote_code(config), pooling=pooling,
        query_prompt=str(settings.get("query_prompt", query)),
        document_prompt=str(settings.get("document_prompt", document)),
        window=_window(path, config, settings), hidden_size=_hidden_size(path, config),
        modules=tuple(modules))


def _hidden_size(path: Path, config: dict[str, Any]) -> int:
    """The width of the transformer's token states (DistilBERT names it ``dim``)."""
    for key in ("hidden_size", "dim", "d_model"):
        if isinstance(config.get(key), int):
            return int(config[key])
    raise ConfigError(f"{path.name}: config.json names no hidden size")


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from exc


def _modules(path: Path) -> list[dict[str, Any]]:
    file = path / "modules.json"
    return list(_read_json(file)) if file.is_file() else []


def _st_config(path: Path) -> dict[str, Any]:
    file = path / "config_sentence_transformers.json"
    return dict(_read_json(file)) if file.is_file() else {}


def _settings_file(path: Path) -> dict[str, Any]:
    file = path / SETTINGS_FILE
    if not file.is_file():
        return {}
    try:
        settings = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from exc
    unknown = set(settings) - {"pooling", "query_prompt", "document_prompt", "window"}
    if unknown:
        raise ConfigError(f"{file}: unknown settings {', '.join(sorted(unknown))} (known: "
                          "pooling, query_prompt, document_prompt, window)")
    return settings


def _pooling_mode(mode: str, path: Path) -> str:
    if mode not in POOLING_MODES:
        raise ConfigError(f"{path.name}: unknown pooling {mode!r} "
                          f"(known: {', '.join(POOLING_MODES)})")
    return mode


def _st_pooling(folder: Path) -> tuple[str, ...]:
    cfg = _read_json(folder / "config.json")
    if cfg.get("include_prompt") is False:
        raise ConfigError(f"{folder.parent.name}: pooling that leaves out the prompt's tokens "
                          "(include_prompt: false) is not supported")
    modes = tuple(mode for mode in POOLING_MODES if cfg.get(_ST_POOLING_KEYS[mode]))
    if not modes:
        raise ConfigError(f"{folder}: the pooling config selects no pooling mode")
    return modes


def _dense(folder: Path) -> Dense:
    cfg = _read_json(folder / "config.json")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ConfigError(f"{folder}: Dense weights must be model.safetensors (a pickled "
                          "pytorch_model.bin is never loaded)")
    activation = str(cfg.get("activation_function", "torch.nn.modules.linear.Identity"))
    known = {"torch.nn.modules.linear.Identity": "identity",
             "torch.nn.modules.activation.Tanh": "tanh"}
    if activation not in known:
        raise ConfigError(f"{folder}: Dense activation {activation} is not supported "
                          "(Identity and Tanh are)")
    return Dense(weights, int(cfg["in_features"]), int(cfg["out_features"]),
                 bool(cfg.get("bias", True)), known[activation])


def _prompts(st_config: dict[str, Any]) -> tuple[str, str]:
    """The query and document prompts: the first published name of each side; a
    ``default_prompt_name`` (applied to everything by sentence-transformers) fills
    a side that has none."""
    prompts = {str(k): str(v) for k, v in (st_config.get("prompts") or {}).items()}
    default = prompts.get(str(st_config.get("default_prompt_name") or ""), "")
    query = next((prompts[n] for n in QUERY_PROMPT_NAMES if n in prompts), default)
    document = next((prompts[n] for n in DOCUMENT_PROMPT_NAMES if n in prompts), default)
    return query, document


def _window(path: Path, config: dict[str, Any], settings: dict[str, Any]) -> int:
    positions = int(config.get("max_position_embeddings", 512))
    positions -= OFFSET_POSITIONS.get(str(config.get("model_type")), 0)
    window = positions
    st_file = path / "sentence_bert_config.json"
    if st_file.is_file():
        window = int(_read_json(st_file).get("max_seq_length") or positions)
    window = int(settings.get("window", window))
    if not 3 <= window <= positions:
        raise ConfigError(f"{path.name}: window {window} is outside 3..{positions} "
                          "(the model's positions)")
    return window


def _remote_code(config: dict[str, Any]) -> str:
    """The model's own code that loading it would run, when transformers has no class of
    its own for it (transformers is imported only for a model that ships code)."""
    auto = str((config.get("auto_map") or {}).get("AutoModel", ""))
    if not auto:
        return ""
    from transformers import CONFIG_MAPPING

    return "" if str(config.get("model_type", "")) in CONFIG_MAPPING else auto
