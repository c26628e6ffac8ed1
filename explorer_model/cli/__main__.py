"""python -m explorer_model.cli: the llama-explorer command."""
import sys

from . import main

sys.exit(main())
