import sys

from cox.main import main

sys.exit(main())
