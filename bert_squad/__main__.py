from bert_squad.cli import main

raise SystemExit(main())
