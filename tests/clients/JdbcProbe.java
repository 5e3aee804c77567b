// What DBeaver and other JDBC tools do on connect, through PostgreSQL's JDBC driver:
// server metadata, schemas, tables and columns from pg_catalog, then a DP query.
// Used by tests/it/serve.rs: java JdbcProbe PORT USER PASSWORD
import java.sql.*;

public class JdbcProbe {
    public static void main(String[] a) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + a[0] + "/dpflow?sslmode=disable";
        try (Connection c = DriverManager.getConnection(url, a[1], a[2])) {
            DatabaseMetaData md = c.getMetaData();
            System.out.println("product " + md.getDatabaseProductName());
            try (ResultSet r = md.getSchemas()) {
                while (r.next()) System.out.println("schema " + r.getString(1));
            }
            try (ResultSet r = md.getTables(null, "public", "%", new String[] {"TABLE"})) {
                while (r.next()) System.out.println("table " + r.getString("TABLE_NAME"));
            }
            try (ResultSet r = md.getColumns(null, "public", "adult", "%")) {
                int n = 0;
                while (r.next()) n++;
                System.out.println("columns " + n);
            }
            try (Statement s = c.createStatement();
                    ResultSet r = s.executeQuery("SELECT sex, dp_count(*) AS n FROM adult GROUP BY sex ORDER BY sex")) {
                while (r.next()) System.out.println("row " + r.getString(1) + " " + r.getLong(2));
            }
        }
    }
}
