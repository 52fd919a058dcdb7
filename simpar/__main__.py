import sys

from simpar.cli import main

sys.exit(main())
