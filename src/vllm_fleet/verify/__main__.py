"""``python -m vllm_fleet.verify --config verify.json --out DIR``."""

import sys

from vllm_fleet.verify.runner import main

sys.exit(main(sys.argv[1:]))
