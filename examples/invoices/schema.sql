-- The application's own table: an order has at most one invoice, which the database enforces.
CREATE TABLE IF NOT EXISTS invoices (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id     text        NOT NULL UNIQUE,
    amount_cents integer     NOT NULL CHECK (amount_cents >= 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);
