import sys

from conformance.sweep import main

sys.exit(main())
