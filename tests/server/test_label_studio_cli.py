"""``pcd serve``'s Label Studio options: refused where they cannot apply, before anything loads."""

from __future__ import annotations

import pytest

from ..helpers import flat, pcd

SCHEMA = "schemas/airline_sentiment.yaml"


@pytest.mark.parametrize("args, message", [
    (["--retrain-every", "5"], "--retrain-every: applies to --label-studio only; add --label-studio"),
    (["--label-studio-url", "http://127.0.0.1:8080", "--state-dir", "x"],
     "--label-studio-url, --state-dir: applies to --label-studio only; add --label-studio"),
    (["--tune-from-rows", "50"], "--tune-from-rows: applies to --label-studio only; add --label-studio"),
    (["--label-studio", "--label-studio-url", "127.0.0.1:8080"],
     "--label-studio-url '127.0.0.1:8080': give Label Studio's http:// or https:// address"),
    (["--label-studio", "--engine", "ray"], "--label-studio with --engine ray"),
])
def test_label_studio_options_refused_with_exit_2(args, message):
    result = pcd("serve", "-s", SCHEMA, *args, code=None)
    if "ray" in args and result.exit_code == 3:
        pytest.skip("Ray Serve is not installed (checked first)")
    assert result.exit_code == 2
    assert message in flat(result.stderr)
