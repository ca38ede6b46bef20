from nkilib_msda.cli import main

raise SystemExit(main())
