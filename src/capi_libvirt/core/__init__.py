"""The pure core: decisions and documents (specs in, XML/ISO bytes and plans out), no I/O, no processes, no clocks."""
