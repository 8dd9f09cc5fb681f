import sys

from shapeplan.cli import main

sys.exit(main())
