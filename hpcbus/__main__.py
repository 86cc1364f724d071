from hpcbus.cli import main

raise SystemExit(main())
