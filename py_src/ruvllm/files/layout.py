"""What a model is made of, as files: the one description every reader follows (runtime/assembly.py on
disk, over fetch and in the npm worker; the hub downloader; the converter).

A model is a GGUF file (its header holds the config and the tokenizer), or a folder of

    config.json                       required
    tokenizer.json                    required (not to make an engine alone: runtime/assembly.py)
    tokenizer_config.json             optional
    generation_config.json            optional
    model.safetensors.index.json      optional: names the shards; without it, the weights are
    model.safetensors                 (or the shards the index names)

Shards are taken from the index, never from a listing of the folder (a folder may hold other
safetensors files: an adapter, a learning state), sorted by name and each checked to be a plain file
name of the folder, so no name from outside becomes a path.
"""

from __future__ import annotations

from ..errors import LoadError

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"

# The folder's JSON documents in the order they are read, each with whether it may be missing: the config
# first (a wrong location or an unsupported model is told before anything else is read), the index last
# (it says which weight files follow).
DOCUMENTS: tuple[tuple[str, bool], ...] = (
    (CONFIG, False),
    (TOKENIZER, False),
    (TOKENIZER_CONFIG, True),
    (GENERATION_CONFIG, True),
    (WEIGHTS_INDEX, True),
)


def is_gguf_name(name: str) -> bool:
    """True when `name` (a path, a URL or a file name) names a GGUF file rather than a folder."""
    return name.split("?", 1)[0].lower().endswith(".gguf")


def weight_files(index: object | None, where: str = WEIGHTS_INDEX) -> list[str]:
    """The weight files of a folder whose model.safetensors.index.json is `index` (its parsed document;
    None: the folder has none, so its weights are model.safetensors). `where` names the index in errors."""
    if index is None:
        return [WEIGHTS]
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise LoadError(f"{where}: not a safetensors index (it has no weight_map naming the weight files)")
    for shard in weight_map.values():
        if not isinstance(shard, str) or not is_plain_name(shard):
            raise LoadError(f"{where}: weight_map names {shard!r}, not a file name in the model folder")
    return sorted(set(weight_map.values()))


def is_plain_name(name: str) -> bool:
    """True for a file name of a folder: no separator, not empty, not `.` or `..`."""
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name
