from nkilib_msda.tools.cli import main

raise SystemExit(main())
