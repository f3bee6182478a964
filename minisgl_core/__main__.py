from minisgl_core.entry import main

raise SystemExit(main())
