from minisgl_core.cli import main

raise SystemExit(main())
