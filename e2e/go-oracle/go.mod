module edgeprof.test/go-oracle

go 1.19
