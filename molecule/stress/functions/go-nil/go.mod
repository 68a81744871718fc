module example.com/gonil

go 1.23
