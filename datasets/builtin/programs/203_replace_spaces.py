print(input().replace(" ", "%20"))
