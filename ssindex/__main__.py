from ssindex.cli import main

main()
