"""Starting the worker safely: the bind rule and option checks, before anything loads.

The token checks on requests are in ``test_worker_app.py`` (over real HTTP).
"""

import subprocess
import sys
from pathlib import Path

import pytest

from engine.worker.__main__ import WorkerConfig, build_parser, make_config
from engine.worker.auth import ConfigError
from tests.worker_process import REPO


def config_for(*argv: str) -> WorkerConfig:
    return make_config(build_parser().parse_args(list(argv)))


def test_non_loopback_without_a_token_refuses_to_start() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "engine.worker", "--host", "0.0.0.0", "--port", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "non-loopback" in proc.stderr and "--token-file" in proc.stderr
    assert "listening" not in proc.stdout


def test_tokens_are_read_and_must_differ(tmp_path: Path) -> None:
    user, admin = tmp_path / "user", tmp_path / "admin"
    user.write_text("u-token\n")
    admin.write_text("a-token\n")
    config = config_for("--host", "0.0.0.0", "--token-file", str(user),
                        "--admin-token-file", str(admin))
    assert (config.user_token, config.admin_token) == ("u-token", "a-token")
    assert "u-token" not in repr(config) and "a-token" not in repr(config)
    with pytest.raises(ConfigError, match="must differ"):
        config_for("--token-file", str(user), "--admin-token-file", str(user))


def test_profiles_and_explicit_models() -> None:
    appliance = config_for()
    assert (appliance.target, appliance.draft) == (
        "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
    assert config_for("--profile", "light").draft is None
    own = config_for("--target", "/models/mine")
    assert (own.target, own.draft) == ("/models/mine", None)  # no foreign draft
    with pytest.raises(ConfigError, match="num-draft-tokens"):
        config_for("--num-draft-tokens", "99")
