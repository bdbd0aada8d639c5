from cox_versions.service import main

main()
