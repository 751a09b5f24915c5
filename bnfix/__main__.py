from bnfix.cli import main

raise SystemExit(main())
