print("modhostd")
