-- A trigger that enqueues a job for each new order, in the inserting transaction: the job
-- exists only if the order commits.
CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, total numeric NOT NULL);

CREATE FUNCTION orders_enqueue_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgworker.enqueue('send-receipt', jsonb_build_object('order_id', NEW.id),
                             priority => 'high', idempotency_key => 'receipt-' || NEW.id);
    RETURN NEW;
END
$$;

CREATE TRIGGER orders_receipt AFTER INSERT ON orders
    FOR EACH ROW EXECUTE FUNCTION orders_enqueue_receipt();
