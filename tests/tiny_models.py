"""Tiny real models made from configs: random weights saved as safetensors and the
bundled model's real tokenizer, one per architecture, with sentence-transformers files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ssindex.backends.model import ModelSpec

HIDDEN = 32
_COMMON = {"vocab_size": 30522, "pad_token_id": 0}
_BERT_LIKE = {"hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "max_position_embeddings": 128}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "bert": _BERT_LIKE,
    "roberta": {**_BERT_LIKE, "max_position_embeddings": 130},
    "xlm-roberta": {**_BERT_LIKE, "max_position_embeddings": 130},
    "distilbert": {"dim": HIDDEN, "n_layers": 2, "n_heads": 2, "hidden_dim": 64,
                   "max_position_embeddings": 128},
    "mpnet": {**_BERT_LIKE, "max_position_embeddings": 130},
    "electra": {**_BERT_LIKE, "embedding_size": HIDDEN},
    "albert": {**_BERT_LIKE, "embedding_size": 16},
    "deberta-v2": {**_BERT_LIKE, "max_relative_positions": 64, "position_buckets": 32,
                   "relative_attention": True, "pos_att_type": ["p2c", "c2p"]},
    "modernbert": {"hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "intermediate_size": 64, "max_position_embeddings": 128,
                   "bos_token_id": 101, "eos_token_id": 102, "cls_token_id": 101,
                   "sep_token_id": 102, "global_attn_every_n_layers": 2,
                   "local_attention": 16},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")


def make_model(target: Path, model_type: str = "bert", *, pooling: str = "mean",
               prompts: dict[str, str] | None = None, dense: tuple[int, ...] = (),
               normalize: bool = True, max_seq_length: int | None = 64,
               seed: int = 0) -> Path:
    """A model directory at ``target``: ``model_type`` with random weights, the bundled
    tokenizer, and sentence-transformers modules (``pooling``, ``Dense`` layers of the
    given widths, ``Normalize``); ``max_seq_length=None`` leaves out its config."""
    import torch
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **_COMMON, **ARCHITECTURES[model_type])
    model = AutoModel.from_config(config)
    model.save_pretrained(target, safe_serialization=True)
    bundled = ModelSpec.resolve(None).path
    for name in TOKENIZER_FILES:
        shutil.copy(bundled / name, target / name)
    modules: list[dict[str, Any]] = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]
    _write(target / "1_Pooling" / "config.json", {
        "word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": pooling == "weightedmean",
        "pooling_mode_lasttoken": pooling == "lasttoken"})
    width = HIDDEN
    for out in dense:
        folder = f"{len(modules)}_Dense"
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": folder,
                        "type": "sentence_transformers.models.Dense"})
        _dense(target / folder, width, out)
        width = out
    if normalize:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    _write(target / "modules.json", modules)
    if max_seq_length is not None:
        _write(target / "sentence_bert_config.json", {"max_seq_length": max_seq_length})
    if prompts is not None:
        _write(target / "config_sentence_transformers.json",
               {"prompts": prompts, "default_prompt_name": None})
    return target


def _dense(folder: Path, width: int, out: int) -> None:
    import torch
    from safetensors.torch import save_file

    linear = torch.nn.Linear(width, out)
    folder.mkdir(parents=True)
    save_file({f"linear.{k}": v.contiguous() for k, v in linear.state_dict().items()},
              folder / "model.safetensors")
    _write(folder / "config.json", {"in_features": width, "out_features": out, "bias": True,
                                    "activation_function": "torch.nn.modules.activation.Tanh"})


def _write(file: Path, data: Any) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(data), encoding="utf-8")
