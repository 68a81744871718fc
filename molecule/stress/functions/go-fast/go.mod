module example.com/gofast

go 1.23
