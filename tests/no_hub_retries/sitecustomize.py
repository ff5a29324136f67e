"""Imported at start-up by build subprocesses whose PYTHONPATH names this folder (conftest.hub_env).

huggingface_hub retries a refused connection five times with 1+2+4+8+8 s of backoff before hf_hub_download
gives up; a test of an unreachable Hub needs the first failure, not the 23 s wait."""

from huggingface_hub.utils import _http

_http.http_backoff.__kwdefaults__["max_retries"] = 0
