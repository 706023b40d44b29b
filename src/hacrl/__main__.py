from hacrl.cli import main

raise SystemExit(main())
