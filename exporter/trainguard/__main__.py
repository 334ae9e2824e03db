from trainguard.exporter.cli import main

raise SystemExit(main())
