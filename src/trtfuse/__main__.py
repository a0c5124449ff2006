from trtfuse.cli import main

raise SystemExit(main())
