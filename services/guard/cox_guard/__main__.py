from cox_guard.service import main

main()
