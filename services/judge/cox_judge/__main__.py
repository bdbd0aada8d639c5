from cox_judge.service import main

main()
