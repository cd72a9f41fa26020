"""apexrl: distributed prioritized experience replay (Ape-X) as gRPC microservices."""
