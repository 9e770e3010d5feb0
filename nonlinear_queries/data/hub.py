"""
The Hugging Face hub seen from this repo: whether to go online at all, where the hub is,
and a fast reachability probe, so that an unreachable hub is one clear error within
seconds instead of datasets' or lm-eval's minutes of retries, a DataError (nonlinear_queries.errors,
the one error for unusable data or an unreachable source, raised by corpus, batches and downstream too).
"""

import os

import httpx

from nonlinear_queries.errors import DataError

TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # how datasets and huggingface_hub read boolean env vars


def hub_offline():
    """True if HF_HUB_OFFLINE or HF_DATASETS_OFFLINE asks to stay off the network."""
    return any(os.environ.get(var, "").upper() in TRUE_VALUES for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_endpoint():
    """The hub URL that huggingface_hub uses: $HF_ENDPOINT, default https://huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def check_hub_reachable(timeout=5.0):
    """
    Raise DataError within about `timeout` seconds if the hub endpoint does not answer,
    instead of datasets' ~25 s of retries. Any HTTP answer counts as reachable; httpx
    honours the same proxy variables as huggingface_hub.
    """
    endpoint = hub_endpoint()
    try:
        httpx.head(endpoint, timeout=timeout)
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        raise DataError(
            f"cannot reach the Hugging Face hub at {endpoint} ({e.__class__.__name__}: {e}). "
            f"Download the data set where the hub is reachable and pass the local copies with "
            f"--input FILE... (.parquet, .jsonl, .json or .txt)"
        ) from e
