"""``python -m dynamicemb_core plugins`` prints every plugin with its version, hooks and names."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from dynamicemb_core.plugins.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_text_listing_names_builtins_with_version_and_hooks() -> None:
    out = io.StringIO()
    assert main([], out=out) == 0
    text = out.getvalue()
    assert "dynamicemb_core: dynamicemb-core" in text
    assert "hooks: dynamicemb_register_admission_strategies, dynamicemb_register_counters" in text
    assert "\n  dict " in text and "\n  frequency " in text


def test_json_listing_is_machine_readable() -> None:
    out = io.StringIO()
    main(["--json"], out=out)
    plugins = {p["name"]: p for p in json.loads(out.getvalue())}
    core = plugins["dynamicemb_core"]
    assert core["distribution"] == "dynamicemb-core" and core["version"]
    assert ["counters", "kv"] in core["provides"]


def test_module_entry_point_dispatches_to_the_plugins_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dynamicemb_core", "plugins"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, "DYNAMICEMB_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "external_storage (2):" in result.stdout
    assert "DYNAMICEMB_DISABLE_PLUGIN_AUTOLOAD is set" in result.stdout
