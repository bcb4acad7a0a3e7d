from stepsim.cli import main

raise SystemExit(main())
