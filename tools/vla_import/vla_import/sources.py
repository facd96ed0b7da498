"""Where a release or checkpoint comes from: a local directory, or a Hub repo id downloaded
with huggingface_hub (only the files the importer reads)."""

from pathlib import Path

from .errors import ImportRefused

RELEASE_FILES = ["ctx/*", "golden/*", "onnx/**", "convert_report.json", "README.md"]
CHECKPOINT_FILES = ["config.json", "processor_config.json", "preprocessor_config.json", "tokenizer.json",
                    "tokenizer_config.json", "special_tokens_map.json", "norm_stats.json",
                    "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
                    "policy_*processor*.json", "policy_*processor*.safetensors"]
# A Fast-WAM checkpoint (upstream's layout): the open-loop import reads only the statistics; the
# closed loop also the .pt (for its proprio Linear: the whole file, mot included, is fetched)
# and Wan's text encoder and tokenizer.
FASTWAM_FILES = ["*_dataset_stats.json"]
FASTWAM_CHAIN_FILES = FASTWAM_FILES + ["*.pt", "models_t5_umt5-xxl-enc-bf16.safetensors", "google/umt5-xxl/*"]
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "model-*.safetensors")
# The Hugging Face checkpoint a LeRobot one names: its weights only when the LeRobot checkpoint
# lacks an embedding tensor (a full MolmoAct2 is many GB).
BASE_FILES = [f for f in CHECKPOINT_FILES if f not in WEIGHTS]


def resolve(source: str, patterns: list, what: str) -> Path:
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise ImportRefused(source, f"{what}: expected a directory or a Hub repo id, found a file")
    if source.count("/") != 1 or source.startswith((".", "/")):
        raise ImportRefused(source, f"{what}: no such directory (and not a Hub repo id 'owner/name')")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, allow_patterns=patterns))
    except Exception as exc:  # network, auth or missing repo: one line with the cause
        raise ImportRefused(source, f"{what}: not a local directory, and as a Hub repo id the download failed: "
                            f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc
