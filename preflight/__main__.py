"""`python -m preflight`: the preflight command without the rest of warden (needs only torch)."""

import sys

from preflight.cli import main

sys.exit(main())
