import sys

from mhjax.cli import main

sys.exit(main())
