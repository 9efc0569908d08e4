"""Loading pretrained weights: a local folder or the Hugging Face cache first, the hub only when
reachable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tasks.errors import ZhpipeError

T = TypeVar("T")


class ModelMissingError(ZhpipeError):
    """A pretrained model is neither local nor downloadable."""


def _missing_model_message(what: str, ref: str, error: Exception) -> str:
    return (
        f"{what} '{ref}' not found locally and could not be downloaded ({type(error).__name__}); "
        f"provide it as a local folder, or put it in the Hugging Face cache ($HF_HOME), "
        f"e.g. run `huggingface-cli download {ref}` where there is a network"
    )


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the model hub can be reached at all; without this check a missing model costs a
    minute of retries before the hub client gives up."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def load_pretrained(ref: str, load: Callable[[str, bool], T], what: str = "model") -> T:
    """`load(source, local_files_only)` from a folder or the cache, else from the hub; one clear
    error otherwise."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(ref).expanduser()
    source = str(path) if path.exists() else ref
    try:
        return load(source, True)
    except OSError as local_error:  # transformers raises OSError for "not found"
        if path.exists() or not hub_reachable():
            raise ModelMissingError(_missing_model_message(what, ref, local_error)) from local_error
        try:
            return load(source, False)
        except OSError as e:
            raise ModelMissingError(_missing_model_message(what, ref, e)) from e
