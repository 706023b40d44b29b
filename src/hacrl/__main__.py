from hacrl.tools.cli import main

raise SystemExit(main())
