"""`python -m plugin` runs the plugin (the standalone build starts here)."""

import sys

from plugin.main import main

sys.exit(main())
