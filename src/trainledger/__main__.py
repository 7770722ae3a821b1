from trainledger.cli import main

main()
