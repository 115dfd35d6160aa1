print("modhostctl")
