from cuforge.cli import main

main()
