from cox_gateway.service import main

main()
