from cox_runner.service import main

main()
