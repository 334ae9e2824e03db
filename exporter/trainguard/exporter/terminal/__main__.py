import sys

from trainguard.exporter.terminal import main

sys.exit(main())
